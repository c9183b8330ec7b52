"""lamina.autograd — the autograd layer (reverse-mode differentiation).

Kernels of this layer register at the AUTOGRAD dispatch key; a tensor's key set has
that bit only while it requires grad, so other tensors never enter the layer.
"""
