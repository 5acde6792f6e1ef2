"""Data: datasets as uint8 arrays, the images the analyses run on, the synthetic shapes, the cache."""
