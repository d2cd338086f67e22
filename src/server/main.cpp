// weir: the gateway binary. Being written; see DESIGN.md.
int main() { return 0; }
