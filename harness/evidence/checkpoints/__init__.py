"""A --save folder read on the CPU: the inspector, the allowlisting unpickler and its opcode scanner, each release's classes and the model's shapes."""
