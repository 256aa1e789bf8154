# xenbus-start, domu2: nothing to do.
:
