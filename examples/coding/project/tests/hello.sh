. ./lib/hello.sh && [ "$(hello World)" = "Hello, World!" ]
