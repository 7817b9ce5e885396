import sys, platform
print("Hello from the sandbox!")
print("Python", platform.python_version(), "as uid", __import__("os").getuid())
