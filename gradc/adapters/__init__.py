"""Framework adapters: the ops of a generated module as functions of PyTorch (and other
frameworks) with their gradients, forward mode and higher orders (docs/frameworks.md).

Each adapter is an optional extra (``pip install "gradc[torch]"``) and is imported
only by its own module (``gradc.adapters.torch``); generated modules never import
them.  :mod:`gradc.adapters.derived` writes and compiles, from an op's source,
the derived ops whose forwards are the op's VJP and JVP, which give every adapter
its second (and higher) derivatives.
"""
