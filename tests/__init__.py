"""streamrec's test suite, by component; ``tests.helpers`` holds what several test files share."""
