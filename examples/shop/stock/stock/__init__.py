"""Stock: items available and reserved per sku, reserved for orders as they are placed."""
