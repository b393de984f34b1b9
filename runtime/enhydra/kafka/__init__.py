"""The Kafka access layer: the only place Enhydra builds aiokafka clients.

    clients.py   producers, consumers and admin clients from a `Connection` (TLS, SASL)
    errors.py    what a failed Kafka call means to a user: one line, the setting, a hint
    reading.py   partitions, end offsets, reading offset ranges and whole topics to their end
    groups.py    consumer groups from the outside: members, offsets, simple commits, rejoin
    topics.py    creating and checking the topics a service needs
    noise.py     aiokafka's connection errors, rate-limited while a broker is down

Everything else asks these modules; nothing outside this folder constructs an aiokafka client
or touches aiokafka's private attributes.
"""
