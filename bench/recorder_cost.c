/*
 * The in-process recorder's work per byte and per send, without a training job:
 * a program that sends one training round's gRPC responses (HTTP/2 frames as
 * gRPC lays them out) over a loopback TCP connection, as one task's sending
 * threads do, so that bench/recorder_cost.py can count the instructions it takes
 * with and without the recorder library preloaded (valgrind --tool=callgrind),
 * and time its CPU.
 *
 *   recorder_cost PORT SIZES_FILE CHUNK_BYTES ROUNDS
 *
 * Listens on 127.0.0.1:PORT (the port the recorder follows), connects to itself,
 * and sends from the accepted (server) side: per message of SIZES_FILE (one size
 * a line), a HEADERS frame, the 5-byte gRPC prefix and the message in DATA frames
 * of at most 16384 bytes, and a trailing HEADERS frame that ends the stream.  Each
 * sendmsg call passes at most CHUNK_BYTES (what a kernel accepts at once: a whole
 * write on loopback, a few KB on a shaped link) in at most 260 iovecs, one per
 * frame header and one per payload piece, as gRPC's TCP writer does.  A thread
 * drains the other end.  Prints one line: bytes, sendmsg calls, the sending
 * thread's CPU nanoseconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME 16384
#define MAX_IOV 260

static uint8_t payload[MAX_FRAME];
static uint8_t headers_block[16] = {0x88, 0x5f, 0x10, 'a', 'p', 'p', 'l', 'i',
                                    'c', 'a', 't', 'i', 'o', 'n', '/', 'g'};

struct pending {
    struct iovec iov[MAX_IOV];
    uint8_t heads[MAX_IOV][9];
    uint8_t prefixes[MAX_IOV][5];
    int count, prefix_count;
    size_t bytes;
};

static int sender;
static size_t chunk;
static unsigned long long calls, sent_total;

static void flush(struct pending *p) {
    struct iovec *iov = p->iov;
    int count = p->count;
    while (count > 0) {
        /* At most CHUNK bytes per call: cut the iovecs there. */
        size_t room = chunk, n = 0;
        int used = 0;
        struct iovec saved = {0};
        while (used < count && room) {
            if (iov[used].iov_len > room) {
                saved = iov[used];
                iov[used].iov_len = room;
                n += room;
                room = 0;
                used++;
                break;
            }
            n += iov[used].iov_len;
            room -= iov[used].iov_len;
            used++;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)used};
        ssize_t r = sendmsg(sender, &msg, 0);
        if (saved.iov_base) iov[used - 1] = saved;
        if (r < 0) {
            perror("sendmsg");
            exit(1);
        }
        calls++;
        sent_total += (unsigned long long)r;
        size_t left = (size_t)r;
        while (count > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            count--;
        }
        if (count > 0 && left) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    p->count = 0;
    p->prefix_count = 0;
    p->bytes = 0;
}

/* One frame: its header and up to two pieces of payload (a gRPC prefix, then bytes). */
static void frame(struct pending *p, uint8_t type, uint8_t flags, uint32_t stream,
                  const uint8_t *prefix, const void *body, uint32_t length) {
    if (p->count + 3 > MAX_IOV) flush(p);
    uint8_t *h = p->heads[p->count];
    h[0] = (uint8_t)(length >> 16);
    h[1] = (uint8_t)(length >> 8);
    h[2] = (uint8_t)length;
    h[3] = type;
    h[4] = flags;
    h[5] = (uint8_t)(stream >> 24);
    h[6] = (uint8_t)(stream >> 16);
    h[7] = (uint8_t)(stream >> 8);
    h[8] = (uint8_t)stream;
    p->iov[p->count++] = (struct iovec){h, 9};
    if (prefix) {
        uint8_t *kept = p->prefixes[p->prefix_count++];
        memcpy(kept, prefix, 5);
        p->iov[p->count++] = (struct iovec){kept, 5};
        length -= 5;
    }
    if (length) p->iov[p->count++] = (struct iovec){(void *)body, length};
    p->bytes += 9 + length;
}

static void message(struct pending *p, uint32_t stream, uint32_t size) {
    frame(p, 1, 0x4, stream, NULL, headers_block, sizeof headers_block);
    /* The gRPC prefix and the message, in DATA frames of at most MAX_FRAME. */
    uint8_t prefix[5] = {0, (uint8_t)(size >> 24), (uint8_t)(size >> 16), (uint8_t)(size >> 8),
                         (uint8_t)size};
    uint64_t left = (uint64_t)size + 5;
    int first = 1;
    while (left) {
        uint32_t n = left < MAX_FRAME ? (uint32_t)left : MAX_FRAME;
        /* Only the first frame starts with the prefix; the rest is message bytes. */
        frame(p, 0, 0, stream, first ? prefix : NULL, payload, n);
        first = 0;
        left -= n;
    }
    frame(p, 1, 0x5, stream, NULL, headers_block, 8);
}

static void *drain(void *arg) {
    int fd = *(int *)arg;
    static uint8_t buffer[1 << 20];
    while (read(fd, buffer, sizeof buffer) > 0) {
    }
    return NULL;
}

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: recorder_cost PORT SIZES_FILE CHUNK_BYTES ROUNDS\n");
        return 2;
    }
    int port = atoi(argv[1]);
    chunk = strtoull(argv[3], NULL, 10);
    int rounds = atoi(argv[4]);
    FILE *f = fopen(argv[2], "r");
    if (!f || !chunk || rounds < 1) {
        fprintf(stderr, "recorder_cost: bad arguments\n");
        return 2;
    }
    uint32_t *sizes = NULL;
    size_t count = 0, capacity = 0;
    unsigned long size;
    while (fscanf(f, "%lu", &size) == 1) {
        if (count == capacity) {
            capacity = capacity ? capacity * 2 : 1024;
            sizes = realloc(sizes, capacity * sizeof *sizes);
        }
        sizes[count++] = (uint32_t)size;
    }
    fclose(f);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 1)) {
        perror("recorder_cost: listen");
        return 1;
    }
    int client = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(client, (struct sockaddr *)&address, sizeof address)) {
        perror("recorder_cost: connect");
        return 1;
    }
    sender = accept(listener, NULL, NULL);
    setsockopt(sender, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t reader;
    pthread_create(&reader, NULL, drain, &client);
    static struct pending pending;
    uint64_t begin = thread_cpu_ns();
    uint32_t stream = 1;
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < count; i++, stream += 2) message(&pending, stream, sizes[i]);
        flush(&pending);
    }
    uint64_t cpu = thread_cpu_ns() - begin;
    shutdown(sender, SHUT_WR);
    pthread_join(reader, NULL);
    printf("%llu %llu %llu\n", sent_total, calls, (unsigned long long)cpu);
    return 0;
}
