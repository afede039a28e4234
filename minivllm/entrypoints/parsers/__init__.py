"""What a choice's text becomes: reasoning parsers (`--reasoning-parser`) and tool-call parsers
(`--tool-call-parser`, and the parsing of forced tool calls)."""
