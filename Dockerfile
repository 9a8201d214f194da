# kvmem-server on Debian 12, in two stages.
#
# build: the same bootstrap script and build commands that README.md and CI
# use (every dependency from Debian's apt).
FROM debian:12 AS build
WORKDIR /src/kvmem
COPY . .
RUN bash deploy/bootstrap.sh \
 && cmake -S . -B build -G Ninja -DKVMEM_BUILD_TESTS=OFF \
 && cmake --build build -j2 --target kvmem-server kvmem kvmem_rados

# runtime: the two binaries and only the shared libraries they need (their
# ELF NEEDED entries mapped to packages with dpkg -S; FAISS is linked
# statically, BLAS/LAPACK come from OpenBLAS), run as an unprivileged user,
# with a health check through the gRPC health service (no API key needed).
FROM debian:12
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libfmt9 libgomp1 libgrpc++1.51 libgrpc29 \
      libopenblas0-pthread libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 libprotobuf32 librados2 librocksdb7.8 \
      libspdlog1.10 \
      libstdc++6 libtomlplusplus3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /data \
      --shell /usr/sbin/nologin kvmem \
 && mkdir -p /data && chown kvmem:kvmem /data
COPY --from=build /src/kvmem/build/bin/kvmem-server /src/kvmem/build/bin/kvmem \
     /src/kvmem/build/bin/libkvmem_rados.so /usr/local/bin/
USER kvmem
VOLUME /data
EXPOSE 50551
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/kvmem", "health", "--addr=127.0.0.1:50551"]
ENTRYPOINT ["/usr/local/bin/kvmem-server", "--listen=0.0.0.0:50551", "--data_dir=/data"]
