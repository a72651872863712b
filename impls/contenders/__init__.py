"""Models of engines' block managers (vLLM v1, nano-vllm, SGLang, LMDeploy), calibrated against the engines' code."""
