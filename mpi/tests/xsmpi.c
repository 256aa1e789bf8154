/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * Checked MPI traffic for the xensock BTL's tests and benchmarks.
 *
 *   xsmpi check [--rounds N] [--max BYTES]
 *       every rank exchanges patterned messages of 1 B .. max with every
 *       other rank (both directions, Isend/Irecv and Sendrecv), a ring
 *       pass, an Allreduce and a Bcast; every byte is verified. Prints
 *       "xsmpi check ok" on rank 0, exits non-zero on the first bad byte.
 *   xsmpi pingpong [--min B] [--max B] [--step K] [--iters N]
 *       ranks 0 and 1: half round-trip latency (us) and bandwidth (MB/s)
 *       per size (min, min*K, ... max), one line each: "pingpong SIZE
 *       LAT_US MBPS"; the data is checked on every round.
 *   xsmpi soak [--seconds S] [--until FILE]
 *       ranks 0 and 1 exchange checked messages of rotating sizes for S
 *       seconds, or until rank 0 sees FILE (for guests moving meanwhile);
 *       prints the rounds done.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;

static void fill(unsigned char *b, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (unsigned char) x;
    }
}

static void verify(const unsigned char *b, size_t n, uint32_t seed, const char *what, int from)
{
    unsigned char *want = malloc(n ? n : 1);
    fill(want, n, seed);
    for (size_t i = 0; i < n; i++) {
        if (b[i] != want[i]) {
            fprintf(stderr, "xsmpi: rank %d: %s from rank %d: byte %zu of %zu is %#x, want %#x\n",
                    rank, what, from, i, n, b[i], want[i]);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    free(want);
}

static uint32_t seed_of(int from, int to, size_t n, int round)
{
    return (uint32_t) (from * 7919 + to * 104729 + (int) n * 31 + round * 1299709);
}

static size_t arg_size(int argc, char **argv, const char *name, size_t dflt)
{
    for (int i = 2; i + 1 < argc; i++) {
        if (0 == strcmp(argv[i], name)) {
            return (size_t) strtoull(argv[i + 1], NULL, 0);
        }
    }
    return dflt;
}

static int check(size_t max, int rounds)
{
    unsigned char *out = malloc(max), *in = malloc(max);
    for (int r = 0; r < rounds; r++) {
        for (size_t n = 1; n <= max; n = n < 16 ? n + 7 : n * 4 - 3) {
            for (int peer = 0; peer < size; peer++) {
                MPI_Request req[2];
                if (peer == rank) {
                    continue;
                }
                fill(out, n, seed_of(rank, peer, n, r));
                MPI_Irecv(in, (int) n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &req[0]);
                MPI_Isend(out, (int) n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &req[1]);
                MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
                verify(in, n, seed_of(peer, rank, n, r), "isend", peer);
                MPI_Sendrecv(out, (int) n, MPI_BYTE, peer, 2, in, (int) n, MPI_BYTE, peer, 2,
                             MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                verify(in, n, seed_of(peer, rank, n, r), "sendrecv", peer);
            }
        }
        /* ring: each rank passes a token that every rank stamps */
        {
            long token[64] = {0};
            int next = (rank + 1) % size, prev = (rank + size - 1) % size;
            if (0 == rank) {
                token[1] = 1000;
                MPI_Send(token, 64, MPI_LONG, next, 3, MPI_COMM_WORLD);
                MPI_Recv(token, 64, MPI_LONG, prev, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (int i = 0; i < size && i < 63; i++) {
                    if (token[i + 1] != 1000 + i) {
                        fprintf(stderr, "xsmpi: ring: rank %d did not stamp the token\n", i);
                        MPI_Abort(MPI_COMM_WORLD, 3);
                    }
                }
            } else {
                MPI_Recv(token, 64, MPI_LONG, prev, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (rank < 63) {
                    token[rank + 1] = 1000 + rank;
                }
                MPI_Send(token, 64, MPI_LONG, next, 3, MPI_COMM_WORLD);
            }
        }
        {
            long mine = rank + 1, sum = 0;
            MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            if (sum != (long) size * (size + 1) / 2) {
                fprintf(stderr, "xsmpi: allreduce: %ld\n", sum);
                MPI_Abort(MPI_COMM_WORLD, 3);
            }
        }
        {
            size_t n = max < 1000000 ? max : 1000000;
            if (0 == rank) {
                fill(out, n, 4242 + r);
            }
            MPI_Bcast(0 == rank ? out : in, (int) n, MPI_BYTE, 0, MPI_COMM_WORLD);
            if (0 != rank) {
                verify(in, n, 4242 + r, "bcast", 0);
            }
        }
    }
    free(out);
    free(in);
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == rank) {
        printf("xsmpi check ok: %d ranks, %d rounds, up to %zu bytes\n", size, rounds, max);
    }
    return 0;
}

/* count ping-pong round trips of n bytes between ranks 0 and 1 */
static void round_trips(unsigned char *out, unsigned char *in, size_t n, int peer, int count)
{
    for (int i = 0; i < count; i++) {
        if (0 == rank) {
            MPI_Send(out, (int) n, MPI_BYTE, peer, 9, MPI_COMM_WORLD);
            MPI_Recv(in, (int) n, MPI_BYTE, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(in, (int) n, MPI_BYTE, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(out, (int) n, MPI_BYTE, peer, 9, MPI_COMM_WORLD);
        }
    }
}

static int pingpong(size_t min, size_t max, size_t step, int iters)
{
    unsigned char *out = malloc(max), *in = malloc(max);
    if (rank > 1) {
        free(out);
        free(in);
        return 0;
    }
    for (size_t n = min; n <= max; n *= step) {
        int it = n >= 1 << 20 ? (iters / 10 > 5 ? iters / 10 : 5) : iters;
        int peer = 1 - rank;
        double t0;
        fill(out, n, seed_of(rank, peer, n, 0));
        round_trips(out, in, n, peer, 3); /* warm up */
        t0 = MPI_Wtime();
        round_trips(out, in, n, peer, it);
        {
            double half = (MPI_Wtime() - t0) / it / 2;
            verify(in, n, seed_of(peer, rank, n, 0), "pingpong", peer);
            if (0 == rank) {
                printf("pingpong %zu %.2f %.1f\n", n, half * 1e6, n / half / 1e6);
                fflush(stdout);
            }
        }
        if (n == 0) {
            break;
        }
    }
    free(out);
    free(in);
    return 0;
}

static int soak(double seconds, const char *until)
{
    size_t max = 4 << 20;
    unsigned char *out = malloc(max), *in = malloc(max);
    double end = MPI_Wtime() + seconds;
    int done = 0, go = 1;
    if (rank > 1) {
        MPI_Barrier(MPI_COMM_WORLD);
        return 0;
    }
    while (go) {
        size_t n = (size_t) 1 << (done % 23);
        int peer = 1 - rank;
        fill(out, n, seed_of(rank, peer, n, done));
        MPI_Sendrecv(out, (int) n, MPI_BYTE, peer, 5, in, (int) n, MPI_BYTE, peer, 5,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        verify(in, n, seed_of(peer, rank, n, done), "soak", peer);
        done++;
        /* rank 0 decides when to stop, so both stop on the same round */
        if (0 == rank) {
            go = MPI_Wtime() < end && (NULL == until || 0 != access(until, F_OK));
            MPI_Send(&go, 1, MPI_INT, peer, 6, MPI_COMM_WORLD);
        } else {
            MPI_Recv(&go, 1, MPI_INT, peer, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == rank) {
        printf("xsmpi soak ok: %d rounds\n", done);
    }
    free(out);
    free(in);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = 2;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size < 2) {
        if (0 == rank) {
            fprintf(stderr, "usage: mpirun -np N xsmpi check|pingpong|soak [options] (N >= 2)\n");
        }
    } else if (0 == strcmp(argv[1], "check")) {
        rc = check(arg_size(argc, argv, "--max", 4 << 20), (int) arg_size(argc, argv, "--rounds", 2));
    } else if (0 == strcmp(argv[1], "pingpong")) {
        size_t step = arg_size(argc, argv, "--step", 2);
        rc = pingpong(arg_size(argc, argv, "--min", 1), arg_size(argc, argv, "--max", 4 << 20),
                      step < 2 ? 2 : step, (int) arg_size(argc, argv, "--iters", 1000));
    } else if (0 == strcmp(argv[1], "soak")) {
        const char *until = NULL;
        for (int i = 2; i + 1 < argc; i++) {
            if (0 == strcmp(argv[i], "--until")) {
                until = argv[i + 1];
            }
        }
        rc = soak((double) arg_size(argc, argv, "--seconds", until ? 86400 : 10), until);
    } else if (0 == rank) {
        fprintf(stderr, "xsmpi: unknown command %s\n", argv[1]);
    }
    MPI_Finalize();
    return rc;
}
