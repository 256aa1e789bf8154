/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* The README's AF_XEN echo server and client (kept equal to it by
 * libxensock/tests/c_header.rs; run by lab/run kmod):
 *   cc $(pkg-config --cflags xensock) -o xen-echo xen-echo.c
 *   xen-echo server <port>           (in one domain)
 *   xen-echo client <domid> <port>   (in another: prints "hello")
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "xensock.h"   /* af-xen-kmod/include/xensock.h */

int main(int argc, char **argv)
{
	int fam = xensock_family();           /* loads an installed af_xen by its alias; sysfs says the number */
	struct sockaddr_xen a = { .sxen_family = fam };
	char buf[4096];
	ssize_t n;
	int fd;

	if (fam < 0) { perror("af_xen not loaded"); return 1; }
	fd = socket(fam, SOCK_STREAM, 0);
	if (fd < 0) { perror("socket"); return 1; }
	if (argc == 3 && !strcmp(argv[1], "server")) {
		a.sxen_domid = XEN_DOMID_ANY;         /* any peer domain */
		a.sxen_port = atoi(argv[2]);
		if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16)) { perror("bind/listen"); return 1; }
		for (;;) {
			struct sockaddr_xen peer;
			socklen_t len = sizeof peer;
			int c = accept(fd, (struct sockaddr *)&peer, &len);
			if (c < 0) { perror("accept"); return 1; }
			printf("connection from domain %u port %u\n", peer.sxen_domid, peer.sxen_port);
			while ((n = read(c, buf, sizeof buf)) > 0)
				write(c, buf, n);
			close(c);
		}
	}
	if (argc == 4 && !strcmp(argv[1], "client")) {
		a.sxen_domid = atoi(argv[2]);         /* the server's domain */
		a.sxen_port = atoi(argv[3]);
		if (connect(fd, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 1; }
		write(fd, "hello", 5);
		shutdown(fd, SHUT_WR);                /* half-close: the server sees EOF */
		while ((n = read(fd, buf, sizeof buf)) > 0)
			fwrite(buf, 1, n, stdout);
		return 0;
	}
	fprintf(stderr, "usage: %s server <port> | client <domid> <port>\n", argv[0]);
	return 2;
}
