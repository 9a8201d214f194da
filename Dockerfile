# kvmem-server on Debian 12, built with the same bootstrap script and build
# commands that README.md and CI use.
FROM debian:12
WORKDIR /src/kvmem
COPY . .
RUN bash deploy/bootstrap.sh \
 && cmake -S . -B build -G Ninja -DKVMEM_BUILD_TESTS=OFF \
 && cmake --build build -j2 --target kvmem-server kvmem \
 && install -m 0755 build/bin/kvmem-server build/bin/kvmem /usr/local/bin/
VOLUME /data
EXPOSE 50551
ENTRYPOINT ["/usr/local/bin/kvmem-server", "--listen=0.0.0.0:50551", "--data_dir=/data"]
