"""Vision-language models: the torchvision-less compatibility layer and tiny VL models."""
