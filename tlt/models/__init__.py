"""Model code shared by the services: tokenizers and the tiny reasoning model."""
