/* Memory read bandwidth on N threads (default 2): each thread sums its own share of a
 * 1 GiB buffer, eight times; prints the best pass in GB/s. The figure decode speed is
 * measured against (benches/at_size.py). Build: cc -O3 -march=native -pthread. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES (1ul << 30)

struct share { const uint64_t *from; size_t words; uint64_t sum; };

static void *read_share(void *arg) {
    struct share *s = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= s->words; i += 4) {
        a += s->from[i]; b += s->from[i + 1]; c += s->from[i + 2]; d += s->from[i + 3];
    }
    s->sum = a + b + c + d;
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > 64) { fprintf(stderr, "threads: 1 to 64\n"); return 2; }
    uint64_t *buffer = malloc(BYTES);
    if (!buffer) { fprintf(stderr, "cannot allocate 1 GiB\n"); return 1; }
    memset(buffer, 1, BYTES);
    double best = 0;
    uint64_t total = 0;
    for (int pass = 0; pass < 8; pass++) {
        pthread_t ids[64];
        struct share shares[64];
        size_t words = BYTES / 8 / threads;
        double start = now();
        for (int t = 0; t < threads; t++) {
            shares[t] = (struct share){buffer + t * words, words, 0};
            pthread_create(&ids[t], NULL, read_share, &shares[t]);
        }
        for (int t = 0; t < threads; t++) { pthread_join(ids[t], NULL); total += shares[t].sum; }
        double rate = BYTES / (now() - start) / 1e9;
        if (rate > best) best = rate;
    }
    printf("%.1f\n", best);
    return total == 0; /* keeps the sums from being optimised away */
}
