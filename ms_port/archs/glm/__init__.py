"""GLM-4 (ChatGLM's remote code and transformers' Glm4) into MindFormers."""
