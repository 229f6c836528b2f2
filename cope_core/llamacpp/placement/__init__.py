"""How llama.cpp places tensors and counts device memory, and the one command builder: the GGUF's
tensor table and device memory (``vram``), ``--fit`` (``fit``), every command line of the family
and every tensor pattern (``command``). Imports nothing else of the package."""
