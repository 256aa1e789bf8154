# kmod, domu2: load the module and run the single-domain C tests.
. /scenario/common.sh
