// SPDX-License-Identifier: GPL-2.0
/*
 * runas UID CMD [ARG...]: runs CMD as user and group UID with no
 * supplementary groups, as an unprivileged user's program would run
 * (the lab's initramfs has no su or setpriv).
 */
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: runas UID CMD [ARG...]\n");
		return 64;
	}
	uid_t id = (uid_t)atoi(argv[1]);
	if (setgroups(0, NULL) || setgid(id) || setuid(id)) {
		perror("runas");
		return 1;
	}
	execvp(argv[2], argv + 2);
	perror(argv[2]);
	return 127;
}
