"""ONNX files to irc graphs: initializers become weights, nodes map to irc ops."""
