"""Example tasks (loops/task): each file is one task, with its command, runtime and result in its docstring."""
