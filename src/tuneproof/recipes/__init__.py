"""One module per end-to-end command (torchtune-style recipes); each states its features in its docstring."""
