"""A model of one's own, outside the zoo: see README.md."""
