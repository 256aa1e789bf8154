# xenbus-overwrite, domu2: nothing to do.
:
