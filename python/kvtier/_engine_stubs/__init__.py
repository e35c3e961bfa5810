"""Local stand-ins for engine base classes, used only when the engine is not
importable. Each mirrors the engine's own definition (names, parameters,
defaults); python/tests/test_sglang_hicache.py checks both against a table
recorded from the engine's source."""
