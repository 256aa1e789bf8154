/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xsrepro: the minimal reproducer of each bug the system-call fuzzer
 * (xsfuzz.c) found in af_xen.ko, one case each; run by the kmod scenarios.
 * Each case is the shortest sequence of calls that hit the bug, and
 * checks what the module must do instead.
 *
 *   xsrepro            every case
 *   xsrepro CASE       one case
 *
 * Cases:
 *   mmap   mmap() of an AF_XEN socket called the family's NULL ->mmap
 *          (the kernel oopsed in the caller: "BUG: kernel NULL pointer
 *          dereference" at RIP 0 from mmap_region). Must fail with ENODEV,
 *          as every socket without mappings does, for stream and seqpacket
 *          sockets, unbound and listening.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include "xensock.h"
#include "xstest_common.h"

static void case_mmap(void)
{
	static const int types[] = { SOCK_STREAM, SOCK_SEQPACKET };
	struct sockaddr_xen a;
	unsigned i;

	for (i = 0; i < 2; i++) {
		int s = socket(fam, types[i], 0), listening = 0;

		if (s < 0) {
			result("repro-mmap-socket", 0, "errno=%s", strerrorname_np(errno));
			return;
		}
		for (;;) {
			void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, s, 0);
			int e = errno;
			char name[64];

			snprintf(name, sizeof(name), "repro-mmap-%s%s", types[i] == SOCK_STREAM ? "stream" : "seqpacket",
				 listening ? "-listening" : "");
			result(name, m == MAP_FAILED && e == ENODEV, "m=%p errno=%s want=ENODEV", m,
			       m == MAP_FAILED ? strerrorname_np(e) : "0");
			if (m != MAP_FAILED)
				munmap(m, 4096);
			if (listening)
				break;
			a = xaddr(XEN_DOMID_ANY, XEN_PORT_ANY);
			if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1))
				break;
			listening = 1;
		}
		close(s);
	}
}

int main(int argc, char **argv)
{
	const char *which = argc > 1 ? argv[1] : "all";
	int any = 0;

	fam = xensock_family();
	if (fam < 0) {
		result("repro-family", 0, "af_xen not loaded");
		return 1;
	}
	if (!strcmp(which, "all") || !strcmp(which, "mmap")) {
		case_mmap();
		any = 1;
	}
	if (!any) {
		fprintf(stderr, "xsrepro: no case %s (cases: mmap)\n", which);
		return 2;
	}
	return failures ? 1 : 0;
}
