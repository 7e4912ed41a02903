"""The turn loop: context -> model -> tools -> records -> events."""
