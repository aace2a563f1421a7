"""Hugging Face configs and checkpoints: config.json to .arch text, HF weight names to irc keys."""
