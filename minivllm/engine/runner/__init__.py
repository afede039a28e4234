"""The model runner: one device's model, KV cache, inputs, CUDA graphs and sampling."""
