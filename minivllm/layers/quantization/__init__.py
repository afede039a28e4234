"""Quantized weights as layers: the quantization config read from config.json
(`config.py`), block-wise FP8 in torch (`fp8_math.py`), the FP8 linear method (`fp8_linear.py`)
and how a model is built with it (`build.py`)."""
