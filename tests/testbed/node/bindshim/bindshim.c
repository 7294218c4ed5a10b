/*
 * Pod networking for the test bed's real node, loaded into every container process with
 * LD_PRELOAD. All pods share the host's network namespace, and each has its own loopback
 * address (PGKUBE_TESTBED_POD_IP, 127.x.y.z). To give each pod its own ports, as its own network
 * namespace would:
 *   - bind() to 0.0.0.0 or 127.0.0.1 binds the pod's address instead, so two pods can both
 *     listen on :5432;
 *   - bind() to :: or ::1 fails with EADDRNOTAVAIL (pods have no IPv6 address), so servers that
 *     listen on every address family keep their IPv4 socket only;
 *   - connect() of a socket that is not bound yet, to a loopback address, binds it to the pod's
 *     address first, so servers see the pod's address as the client's, not 127.0.0.1.
 * Statically linked programs (Go) do not load it; none of the mapped images runs one.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static in_addr_t pod_ip;
static int have_pod_ip;

__attribute__((constructor)) static void read_pod_ip(void) {
    const char *text = getenv("PGKUBE_TESTBED_POD_IP");
    struct in_addr address;
    if (text != NULL && inet_pton(AF_INET, text, &address) == 1) {
        pod_ip = address.s_addr;
        have_pod_ip = 1;
    }
}

static bind_fn real_bind(void) {
    static bind_fn fn;
    if (fn == NULL) fn = (bind_fn)dlsym(RTLD_NEXT, "bind");
    return fn;
}

static connect_fn real_connect(void) {
    static connect_fn fn;
    if (fn == NULL) fn = (connect_fn)dlsym(RTLD_NEXT, "connect");
    return fn;
}

static int is_loopback_v4(in_addr_t address) {
    return (ntohl(address) >> 24) == 127;
}

int bind(int fd, const struct sockaddr *address, socklen_t length) {
    if (have_pod_ip && address != NULL && address->sa_family == AF_INET &&
        length >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4;
        memcpy(&v4, address, sizeof v4);
        if (v4.sin_addr.s_addr == htonl(INADDR_ANY) || v4.sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
            v4.sin_addr.s_addr = pod_ip;
            return real_bind()(fd, (const struct sockaddr *)&v4, sizeof v4);
        }
    }
    if (have_pod_ip && address != NULL && address->sa_family == AF_INET6 &&
        length >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6;
        memcpy(&v6, address, sizeof v6);
        if (IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr) || IN6_IS_ADDR_LOOPBACK(&v6.sin6_addr)) {
            errno = EADDRNOTAVAIL;
            return -1;
        }
    }
    return real_bind()(fd, address, length);
}

int connect(int fd, const struct sockaddr *address, socklen_t length) {
    if (have_pod_ip && address != NULL && address->sa_family == AF_INET &&
        length >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in target, local;
        socklen_t local_length = sizeof local;
        memcpy(&target, address, sizeof target);
        if (is_loopback_v4(target.sin_addr.s_addr) &&
            getsockname(fd, (struct sockaddr *)&local, &local_length) == 0 &&
            local.sin_family == AF_INET && local.sin_port == 0 &&
            local.sin_addr.s_addr == htonl(INADDR_ANY)) {
            struct sockaddr_in source = {.sin_family = AF_INET, .sin_port = 0};
            source.sin_addr.s_addr = pod_ip;
            int saved = errno;
            (void)real_bind()(fd, (const struct sockaddr *)&source, sizeof source);
            errno = saved;
        }
    }
    return real_connect()(fd, address, length);
}
