"""The model: built-in architectures against independent references, a user's model by import path."""
