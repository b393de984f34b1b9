"""Trade statistics: average price per stock symbol in hopping event-time windows."""
