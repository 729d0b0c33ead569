"""What crashes and outages leave behind, found and repaired: lost attempts, lost messages,
stuck runs, the worker hooks that make them visible, and housekeeping."""
