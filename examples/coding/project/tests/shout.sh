. ./lib/shout.sh && [ "$(shout hey)" = "HEY!" ]
