"""Examples of projects that use edgetrain from outside its source tree."""
