"""The community runtime: wires adapters, the engine and storage together."""
