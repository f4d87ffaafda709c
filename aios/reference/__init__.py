"""References we did not write, run so that they cannot take our process down.

``llamacpp``: llama.cpp (through llama-cpp-python) in a child process that may crash; tests,
benchmarks and fixture builders use it to compare aios-run and our exports with llama.cpp.
"""
