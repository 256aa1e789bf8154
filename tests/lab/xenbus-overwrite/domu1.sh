# xenbus-overwrite, domu1: the same request pairs through /dev/xen/xenbus,
# first one request at a time (every reply must be right), then back to
# back (the device overwrites a queued request's body: wrong replies, or
# xenstored aborts and nothing answers any more).
check one-at-a-time sh -c 'xs_overwrite serial 2000 > /tmp/serial.out'
cat /tmp/serial.out
check back-to-back-overwrites sh -c 'xs_overwrite back-to-back 2000 > /tmp/b2b.out'
cat /tmp/b2b.out
echo "xs_overwrite done"
