// SPDX-License-Identifier: GPL-2.0
/* The lab kernel has no NIC driver built in (tinyconfig); the two-host lab
 * builds the in-tree e1000 driver out of tree from the kernel source. */
#include "e1000_hw.c"
