"""Graph passes. Each module exposes `run(graph, ctx) -> graph`; their order lives in pipeline.py."""
