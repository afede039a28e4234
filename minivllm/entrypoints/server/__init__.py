"""The HTTP server (`minivllm serve`): the app and its routes' table, the uvicorn server, the
API-key and body-size checks, errors in each API's shape, metrics, streaming, the server's
state and the Responses store."""
