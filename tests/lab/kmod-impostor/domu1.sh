# kmod-impostor, domu1: the server end of the stream; saved and restored
# in the middle of it.
. /scenario/common.sh
run_c c-save-server move-server $SV_PORT sv
finish
