"""Framework adapters: gradc ops inside the frameworks users train in."""
