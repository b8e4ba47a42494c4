import sys

sys.path.insert(0, "/app")
from greet import greet  # noqa: E402

assert greet("Ada") == "Hello, Ada!", greet("Ada")
assert greet("") == "Hello, world!", greet("")
print("ok")
