"""The `edge sim` evaluation harness: simulated time, simulated device, measured engine speed."""
