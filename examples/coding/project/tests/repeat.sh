. ./lib/repeat.sh && [ "$(repeat ab 3)" = "ababab" ]
