. ./lib/goodbye.sh && [ "$(goodbye World)" = "Goodbye, World!" ]
