"""Weight versions: the view samplers run, lossless patches and keyframes, their entropy coder, publishing."""
