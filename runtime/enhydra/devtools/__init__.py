"""Development provisioning, outside the runtime core: what a laptop or CI machine needs.

A running service never imports this package. It holds the local Apache Kafka broker
(`broker`, fetched with Maven; `broker_security`, its CA, certificates and SCRAM users) and
the podman image recipe (`image`: podman and debootstrap from Debian, a wheelhouse, the build,
a few containers). The `enhydra kafka` and `enhydra image` commands are thin shells over it;
tests, benchmarks and scripts use its functions directly.
"""
