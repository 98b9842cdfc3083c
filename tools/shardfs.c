/* placeholder until its owner lands it */
int main(void) { return 1; }
