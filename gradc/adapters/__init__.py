"""Framework adapters: the ops of a generated module as functions of PyTorch (and other
frameworks) with their gradients, forward mode and higher orders (docs/frameworks.md).

Each adapter is an optional extra (``pip install "gradc[torch]"``) and is imported
only by its own module (``gradc.adapters.torch``); generated modules never import
them.  :mod:`gradc.adapters.higher_order` compiles, from an op's source, the
auxiliary op whose forward is the op's VJP, which gives every adapter its
double backward.
"""
