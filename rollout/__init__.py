"""Generation engines (vLLM, SGLang, HF), weight sync, routing."""
