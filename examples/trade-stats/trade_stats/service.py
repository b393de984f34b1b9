"""The trade statistics service: the trades aggregate with Enhydra's runtime around it."""

from enhydra import Service

from trade_stats.domain import trades

service = Service(
    "trade-stats",
    trades,
    partitions=4,
    web_port=6066,
    num_standby_replicas=1,
    deserialization_exception_handler="dlq",
    processing_exception_handler="dlq",
    schemas={
        "key": "string",
        "commands": {
            "type": "object",
            "properties": {
                "type": {"enum": ["trade"]},
                "symbol": {"type": "string"},
                "price": {"type": "number"},
                "shares": {"type": "integer"},
                "ts": {"type": "integer"},
            },
            "required": ["type", "symbol", "price", "shares", "ts"],
        },
    },
)
